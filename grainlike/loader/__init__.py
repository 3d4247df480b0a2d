"""The DataLoader, its iterator and state, and worker processes."""
