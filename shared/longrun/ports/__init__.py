"""What the use cases ask of the adapters, and the values they exchange."""
