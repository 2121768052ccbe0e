"""The mmreplay command line (installed as ``mmreplay.cli``): a thin click layer over the library."""
