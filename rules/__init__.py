"""Built-in diagnosis rules: one TOML file per rule (see torchwatch.rules_engine)."""
