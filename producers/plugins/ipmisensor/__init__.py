"""BMC sensors over IPMI with FreeIPMI's ipmi-sensors (see README.md)."""
