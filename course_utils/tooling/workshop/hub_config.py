"""The files ``make hub`` writes under ``build/hub/``: JupyterHub's configuration and the nbgrader configuration of
participants and instructor. Nothing here starts anything; :mod:`.hub` does.

JupyterHub's configuration (``jupyterhub_config.py``) reads the workshop's settings (``hub.json``: addresses, the
roster, each user's share of the machine) and the passwords from their files when the hub starts, so no secret is
ever written into it. Each user's single-user server starts under ``taskset`` on that user's cores, with
``OMP_NUM_THREADS`` for the two ranks a launch starts, ``COURSE_BUILD_DIR`` in their home (their runs, figures and
notebooks stay theirs), ``TORCH_EXTENSIONS_DIR`` on their links to the course's built ops, and ``JUPYTER_CONFIG_PATH`` on the nbgrader configuration of their role: the participants'
names the exchange and the course and leaves the formgrader out; the instructor's names the nbgrader course folder
in the instructor's home.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from course_utils.tooling.workshop.nbgrader_course import COURSE_ID

BIN = Path(sys.prefix) / "bin"          # the course's environment: the hub, the proxy, the single-user server
EXCHANGE_ENV = "COURSE_NBGRADER_EXCHANGE"   # nbgrader_course.write_config puts this exchange in the course config

HUB_CONFIG = '''\
# JupyterHub's configuration for the course's workshop server, written by `make hub` (course_utils/tooling/workshop/hub.py).
# The settings are in {settings}; the passwords are read from their files when the hub starts.
import json
from pathlib import Path

s = json.loads(Path({settings!r}).read_text())
c = get_config()
c.JupyterHub.ip = s["ip"]                       # loopback unless `make hub IP=...` (then put TLS in front)
c.JupyterHub.port = s["port"]
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = s["hub_port"]
c.JupyterHub.db_url = "sqlite:///" + s["state"] + "/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = s["state"] + "/cookie_secret"
c.JupyterHub.pid_file = s["state"] + "/jupyterhub.pid"
c.JupyterHub.cleanup_servers = True             # the hub stops every single-user server when it stops
c.ConfigurableHTTPProxy.command = [s["bin"] + "/configurable-http-proxy"]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:%d" % s["proxy_api_port"]
c.ConfigurableHTTPProxy.pid_file = s["state"] + "/proxy.pid"

c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = Path(s["password_file"]).read_text().strip()
c.SharedPasswordAuthenticator.admin_password = Path(s["admin_password_file"]).read_text().strip()
c.Authenticator.admin_users = {{s["instructor"]}}
c.Authenticator.allowed_users = set(s["participants"]) | {{s["instructor"]}}

c.JupyterHub.spawner_class = "localprocess"
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120


def share(spawner):
    """The user's cores (taskset) and environment (threads, build folder, nbgrader configuration): hub.shares."""
    mine = s["shares"][spawner.user.name]
    spawner.cmd = ["taskset", "-c", mine["cpus"], s["bin"] + "/jupyterhub-singleuser"]
    spawner.environment = {{**spawner.environment, **mine["env"]}}     # a dict of this spawner's own


c.Spawner.pre_spawn_hook = share

c.JupyterHub.services = [
    {{"name": "idle-culler", "command": [s["bin"] + "/jupyterhub-idle-culler", "--timeout=%d" % s["idle_timeout"],
                                        "--cull-every=60"]}},
    {{"name": "workshop", "api_token": Path(s["token_file"]).read_text().strip()}},
]
c.JupyterHub.load_roles = [
    {{"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]}},
    {{"name": "workshop", "services": ["workshop"], "scopes": ["admin:users", "admin:servers", "list:users"]}},
]
'''

PARTICIPANT = '''\
# nbgrader for the workshop's participants, written by `make hub`: the exchange and the course
c = get_config()
c.Exchange.root = {exchange!r}
c.CourseDirectory.course_id = {course_id!r}
'''

INSTRUCTOR = '''\
# nbgrader for the workshop's instructor, written by `make hub`: the course folder, the exchange
c = get_config()
c.CourseDirectory.root = {course!r}
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}
'''

# Participants get the Assignments tab; the formgrader and the course list are the instructor's.
PARTICIPANT_SERVER = {"ServerApp": {"jpserver_extensions": {"nbgrader.server_extensions.formgrader": False,
                                                            "nbgrader.server_extensions.course_list": False}}}
# JupyterLab's question whether to fetch Jupyter's news from the internet is left out for everyone.
NO_NEWS = {"@jupyterlab/apputils-extension:announcements": True}
PARTICIPANT_LAB = {"disabledExtensions": {"@jupyter/nbgrader:formgrader": True, "@jupyter/nbgrader:course-list": True,
                                          "@jupyter/nbgrader:create-assignment": True, **NO_NEWS}}


def write(folder: Path, settings: dict) -> Path:
    """Write ``hub.json``, ``jupyterhub_config.py`` and the two roles' Jupyter configuration folders into
    ``folder``; return the hub's configuration file."""
    for role in ("participant", "instructor"):
        (folder / "etc" / role / "labconfig").mkdir(parents=True, exist_ok=True)
        (folder / "etc" / role).chmod(0o755)
    exchange, course_dir = settings["exchange"], settings["instructor_course"]
    (folder / "etc" / "participant" / "nbgrader_config.py").write_text(
        PARTICIPANT.format(exchange=exchange, course_id=COURSE_ID))
    (folder / "etc" / "participant" / "jupyter_server_config.json").write_text(json.dumps(PARTICIPANT_SERVER, indent=1))
    (folder / "etc" / "participant" / "labconfig" / "page_config.json").write_text(json.dumps(PARTICIPANT_LAB, indent=1))
    (folder / "etc" / "instructor" / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": NO_NEWS}, indent=1))
    (folder / "etc" / "instructor" / "nbgrader_config.py").write_text(
        INSTRUCTOR.format(course=course_dir, course_id=COURSE_ID, exchange=exchange))
    for path in (folder / "etc").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    settings_file = folder / "hub.json"
    settings_file.write_text(json.dumps(settings, indent=1))
    settings_file.chmod(0o600)
    config = folder / "jupyterhub_config.py"
    config.write_text(HUB_CONFIG.format(settings=str(settings_file)))
    config.chmod(0o600)
    return config
