"""env -> env manager loop -> prompt tokens -> server -> env step ... -> trajectory -> scheduler."""
