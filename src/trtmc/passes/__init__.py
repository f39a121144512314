"""Graph -> Graph passes. Each is a `graph_pass` (its result must pass `Graph.verify()`) and edits
the graph through the shared `rewrite` walk."""
