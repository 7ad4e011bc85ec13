"""``vgpuctl doctor``: judge what a cluster offers the DRA bridge (pure checks over read facts)."""
