"""What hora's bindings share and needs no framework: elastic training's
State and loop, and its exceptions (Horovod's horovod.common)."""
