"""The draftctl daemon: gateway, classifier, stats, admin API, dashboard and CLI."""
