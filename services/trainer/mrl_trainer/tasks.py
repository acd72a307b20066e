"""The trainer's tasks: mrl.tasks (sdk/mrl/tasks, torch-free, so a lab's trainer imports them without this
package), under the trainer's name for them."""
from mrl.tasks import *  # noqa: F401,F403
from mrl.tasks import __all__  # noqa: F401
