"""The shared model: jobs, resources, snapshots and decisions. No IO here."""
