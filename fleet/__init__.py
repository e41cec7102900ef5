"""k0s-fleet: in-place k0s upgrades across a fleet of Cluster API / k0smotron clusters."""

__version__ = "0.1.0"
