"""Leaf package shared by every tetriserve component; imports nothing of ours."""
