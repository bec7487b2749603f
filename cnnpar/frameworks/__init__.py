"""The same cnn3 under other frameworks, each run in its own subprocess by `cnnpar compare`.

Runner modules (`python -m cnnpar.frameworks.<runner>`) import their framework; this package and
`spec` / `compare` do not, so asking about a framework that is not installed costs nothing.
"""
