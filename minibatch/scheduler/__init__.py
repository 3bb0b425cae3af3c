"""mb-scheduler: decides which pending jobs start where (like Maui)."""
