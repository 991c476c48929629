"""A run in other tools: TensorBoard event files and MLflow runs, for a finished run or
following a running one.  Each writer's library is imported only when it is used.
"""
