"""Ring regions: detection, the sequence-layout analysis, the position rewrite, and the sequence permutations that
ring-reorder inserts and hoist-permutations moves."""
