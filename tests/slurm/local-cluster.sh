#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for `make test-slurm` (tests/lab/test_slurm.py):
# Debian's slurmctld, slurmd and slurmdbd (accounting, which sacct and submitit read) on a
# MariaDB server, with munge. Run as root on a Debian machine with nothing else of SLURM;
# it installs the packages, writes /etc/slurm and starts the daemons (again: it restarts
# them). The node has this machine's cores and the partition is named `debug`; a requeued
# job starts again after 30 s (cred_expire; SLURM's default is 120 s).
#
#   sudo tests/slurm/local-cluster.sh && make test-slurm
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "local-cluster.sh: run it as root (it installs and starts SLURM)." >&2; exit 2; }
command -v apt-get >/dev/null || { echo "local-cluster.sh: needs apt-get (Debian or Ubuntu)." >&2; exit 2; }
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q slurmctld slurmd slurmdbd slurm-client munge mariadb-server >/dev/null

host=$(hostname -s)
cores=$(nproc)
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
mkdir -p /run/munge /var/log/slurm /var/spool/slurmctld /var/spool/slurmd /run/slurm
chown munge:munge /run/munge
[ -s /etc/munge/munge.key ] || { /usr/sbin/mungekey --create 2>/dev/null || \
    dd if=/dev/urandom of=/etc/munge/munge.key bs=128 count=1 2>/dev/null; }
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
pkill -x slurmd || true; pkill -x slurmctld || true; pkill -x slurmdbd || true; pkill -x munged || true
sleep 1
su -s /bin/sh munge -c /usr/sbin/munged

if ! mysqladmin ping >/dev/null 2>&1; then
    (mysqld_safe >/var/log/slurm/mysqld.log 2>&1 &)
    for _ in $(seq 30); do mysqladmin ping >/dev/null 2>&1 && break; sleep 1; done
fi
mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
  CREATE USER IF NOT EXISTS 'slurm'@'localhost';
  ALTER USER 'slurm'@'localhost' IDENTIFIED BY 'bnlab-slurm';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

cat >/etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurm/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=bnlab-slurm
StorageLoc=slurm_acct_db
CONF
chown slurm:slurm /etc/slurm/slurmdbd.conf && chmod 600 /etc/slurm/slurmdbd.conf
cat >/etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host
AuthType=auth/munge
AuthInfo=cred_expire=30
SlurmUser=slurm
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
NodeName=$host CPUs=$cores RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
chown slurm:slurm /var/spool/slurmctld /var/log/slurm /run/slurm

slurmdbd
for _ in $(seq 30); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 1; done
sacctmgr -i add cluster local >/dev/null 2>&1 || true
slurmctld
slurmd
for _ in $(seq 30); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo -h -o %T | grep -q idle || { echo "local-cluster.sh: the node is not idle; see /var/log/slurm/slurmd.log and slurmctld.log." >&2; exit 1; }
sacct -n -X -S now >/dev/null || { echo "local-cluster.sh: sacct cannot reach slurmdbd; see /var/log/slurm/slurmdbd.log." >&2; exit 1; }
sinfo
