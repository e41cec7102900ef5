"""Configuration: the fleet YAML's models, their field types and one-line problems, the
maintenance-window schedule, download URLs, and the loader (flags > environment > YAML).
Pure: nothing here does I/O but the loader's read of the file it is given."""
