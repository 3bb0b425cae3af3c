"""mb-server: the resource manager (like pbs_server / slurmctld)."""
