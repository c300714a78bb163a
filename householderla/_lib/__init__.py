"""Internal helpers: namespaces, dtypes and the linear-algebra shims the standard lacks."""
