"""Neural-network ops (``ctensor.nn.functional``), written with ctensor ops."""
