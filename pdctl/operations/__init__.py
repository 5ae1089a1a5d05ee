"""Operations: changes to a host, each made only when its fact disagrees (see `base`)."""
