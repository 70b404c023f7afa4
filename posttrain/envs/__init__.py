from posttrain.envs import instruction  # noqa: F401
from posttrain.envs import longctx  # noqa: F401
from posttrain.envs import workplace  # noqa: F401
from posttrain.envs import banking  # noqa: F401
from posttrain.envs import code_env  # noqa: F401
from posttrain.envs import math_env  # noqa: F401
from posttrain.envs import mcq  # noqa: F401
from posttrain.envs import structured  # noqa: F401
