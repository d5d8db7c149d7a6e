"""Code shared by the dranet services: pure logic (config model, merge, names) and
small I/O helpers every service uses (logging, Unix-socket gRPC)."""
