#!/usr/bin/env bash
# Make sure the test databases answer: PostgreSQL (127.0.0.1:5432, user postgres, trust,
# database "test") and MariaDB (127.0.0.1:3306, root without password, database "test"); and that
# Chromium and chromedriver are there for the dashboard's browser tests.
# Already running: returns at once. Installed but stopped: starts them. Missing: installs them
# with apt-get, then starts and configures them. Idempotent; no systemd needed.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "ensure-services: not root and no sudo; start PostgreSQL and MariaDB yourself" >&2
    fi
fi

wait_for() {  # wait_for "description" command...
    local what=$1; shift
    for _ in $(seq 1 120); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    echo "ensure-services: $what did not become ready within 60 s" >&2
    return 1
}

apt_install() {
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# ---- PostgreSQL -------------------------------------------------------------------------------
pg_ready() { pg_isready -q -h 127.0.0.1 -p 5432; }
pg_psql() { psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -tAq "$@"; }

pg_cluster_version() { ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1; }

pg_trust_local() {
    # Freshly installed clusters use peer/scram; the tests connect as postgres without password.
    local hba
    hba="/etc/postgresql/$(pg_cluster_version)/main/pg_hba.conf"
    if ! $SUDO grep -q "^host all all 127.0.0.1/32 trust" "$hba"; then
        $SUDO sed -i '1i local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    fi
}

ensure_postgresql() {
    local state="already running"
    if ! command -v pg_isready >/dev/null 2>&1 || ! pg_ready; then
        if [ -z "$(pg_cluster_version)" ]; then
            apt_install postgresql postgresql-client
            state="installed and started"
            pg_trust_local
        else
            state="started"
        fi
        local version
        version=$(pg_cluster_version)
        if [ ! -d "/etc/postgresql/$version/main" ]; then
            $SUDO pg_createcluster "$version" main >/dev/null
            pg_trust_local
        fi
        $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null \
            || $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main restart
        wait_for "PostgreSQL" pg_ready
        if [ "$state" = "installed and started" ]; then
            $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main reload
        fi
    fi
    # Room for the idle-fleet benchmark's 50 workers (6 connections each) and the multi-process
    # tests: the default 100 cut the fleet to 14. Set when this script starts the server (the
    # setting needs a restart); a server already running keeps its own.
    if [ "$state" != "already running" ] \
        && [ "$(pg_psql -d postgres -c "SHOW max_connections")" -lt 400 ]; then
        pg_psql -d postgres -c "ALTER SYSTEM SET max_connections = 400"
        $SUDO pg_ctlcluster --skip-systemctl-redirect "$(pg_cluster_version)" main restart
        wait_for "PostgreSQL" pg_ready
    fi
    if [ "$(pg_psql -d postgres -c "SELECT 1 FROM pg_database WHERE datname = 'test'")" != "1" ]; then
        pg_psql -d postgres -c "CREATE DATABASE test"
    fi
    echo "postgresql: $state"
}

# ---- MariaDB ----------------------------------------------------------------------------------
my_admin() { if command -v mariadb-admin >/dev/null 2>&1; then mariadb-admin "$@"; else mysqladmin "$@"; fi; }
my_client() { if command -v mariadb >/dev/null 2>&1; then mariadb "$@"; else mysql "$@"; fi; }
my_ready() { my_admin -h 127.0.0.1 -uroot --connect-timeout=2 ping >/dev/null 2>&1; }
my_socket_ready() { $SUDO "$(command -v mariadb-admin || command -v mysqladmin)" -uroot ping; }

ensure_mariadb() {
    local state="already running"
    if ! command -v mysqladmin >/dev/null 2>&1 && ! command -v mariadb-admin >/dev/null 2>&1 \
        || ! my_ready; then
        if [ ! -x /usr/sbin/mariadbd ]; then
            apt_install mariadb-server mariadb-client
            state="installed and started"
        else
            state="started"
        fi
        $SUDO mkdir -p /run/mysqld
        $SUDO chown mysql:mysql /run/mysqld 2>/dev/null || true
        # Its thread pool, not a thread per connection: the chaos and multi-process tests and
        # the scale-out benchmark open dozens of connections on a 2-core machine, where a thread
        # per connection spends the server's CPU spinning and switching (README: "Many workers
        # on a small MariaDB").
        $SUDO start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd \
            -- --thread-handling=pool-of-threads
        wait_for "MariaDB" my_socket_ready
    fi
    if ! my_client -h 127.0.0.1 -uroot -e "SELECT 1" >/dev/null 2>&1; then
        # A fresh install lets root in only through the unix socket: allow TCP without password.
        $SUDO "$(command -v mariadb || command -v mysql)" -uroot <<'SQL'
ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
    fi
    wait_for "MariaDB over TCP" my_ready
    my_client -h 127.0.0.1 -uroot -e "CREATE DATABASE IF NOT EXISTS test"
    # The default 151 connections run out when two suites share the server (each worker process
    # of the multi-process and chaos tests holds a pool): raise it for this server's life.
    my_client -h 127.0.0.1 -uroot -e "SET GLOBAL max_connections = GREATEST(@@max_connections, 600)"
    echo "mariadb: $state"
}

# ---- Chromium (the dashboard's browser tests drive it headless through chromedriver) ---------
ensure_chromium() {
    local state="already installed"
    if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
        apt_install chromium chromium-driver
        state="installed"
    fi
    echo "chromium: $state"
}

ensure_postgresql
ensure_mariadb
ensure_chromium
