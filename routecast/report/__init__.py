"""Tables, plots and the self-contained HTML report."""
