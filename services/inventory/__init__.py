"""dranet-inventory: device discovery, ResourceSlice publishing and device lookups."""
