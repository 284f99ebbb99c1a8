#!/usr/bin/env bash
# A SLURM cluster on this machine, for `make test-slurm` (tests/lab/test_slurm.py): Debian's
# slurmctld, slurmd and slurmdbd (accounting, which sacct and submitit read) on a MariaDB
# server, with munge. Run as root on a Debian machine with nothing else of SLURM; it installs
# the packages, writes /etc/slurm and starts the daemons (again: it restarts them). The
# partition is named `debug`; a requeued job starts again after 30 s (cred_expire; SLURM's
# default is 120 s).
#
#   sudo tests/slurm/local-cluster.sh               one node: this machine's cores
#   sudo tests/slurm/local-cluster.sh --two-nodes   node1 and node2, each with this machine's
#        cores, in network namespaces of their own (10.9.0.2 and .3 on a bridge, names in
#        /etc/hosts) as two hosts of a cluster would be; the controller is at 10.9.0.1
#
#   sudo tests/slurm/local-cluster.sh && make test-slurm
set -euo pipefail
two=false
case "${1:-}" in
    "") ;;
    --two-nodes) two=true ;;
    *) echo "local-cluster.sh: unknown option ${1}; give none, or --two-nodes." >&2; exit 2 ;;
esac
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
if $two; then  # two hosts: a network namespace each, on a bridge to this one
    ip link show br-bnlab >/dev/null 2>&1 || {
        ip link add br-bnlab type bridge; ip addr add 10.9.0.1/24 dev br-bnlab; }
    ip link set br-bnlab up
    for i in 1 2; do
        if [ ! -e /var/run/netns/bnlab-node$i ]; then
            ip netns add bnlab-node$i
            ip link add vbnlab$i type veth peer name eth0 netns bnlab-node$i
            ip link set vbnlab$i master br-bnlab
            ip netns exec bnlab-node$i ip addr add 10.9.0.$((i + 1))/24 dev eth0
        fi
        ip link set vbnlab$i up
        ip netns exec bnlab-node$i ip link set eth0 up
        ip netns exec bnlab-node$i ip link set lo up
        grep -q "^10.9.0.$((i + 1)) node$i\$" /etc/hosts || echo "10.9.0.$((i + 1)) node$i" >>/etc/hosts
    done
    controller="$host(10.9.0.1)"
    nodes="NodeName=node1 NodeAddr=10.9.0.2 CPUs=$cores RealMemory=$mem State=UNKNOWN
NodeName=node2 NodeAddr=10.9.0.3 CPUs=$cores RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP"
else
    controller=$host
    nodes="NodeName=$host CPUs=$cores RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP"
fi
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
SlurmctldHost=$controller
AuthType=auth/munge
AuthInfo=cred_expire=30
SlurmUser=slurm
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
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
$nodes
CONF
chown slurm:slurm /var/spool/slurmctld /var/log/slurm /run/slurm

slurmdbd
for _ in $(seq 30); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 1; done
sacctmgr -i add cluster local >/dev/null 2>&1 || true
slurmctld
if $two; then  # each slurmd in its host's network, under that host's name
    for i in 1 2; do
        mkdir -p /var/spool/slurmd/node$i
        nsenter --net=/var/run/netns/bnlab-node$i unshare --uts \
            sh -c "hostname node$i; exec slurmd -N node$i"
    done
else
    mkdir -p /var/spool/slurmd/$host
    slurmd
fi
want=$($two && echo 2 || echo 1)
for _ in $(seq 30); do [ "$(sinfo -h -t idle -o %D 2>/dev/null)" = "$want" ] && break; sleep 1; done
[ "$(sinfo -h -t idle -o %D)" = "$want" ] || { echo "local-cluster.sh: not every node is idle; see /var/log/slurm/slurmd-*.log and slurmctld.log." >&2; exit 1; }
sacct -n -X -S now >/dev/null || { echo "local-cluster.sh: sacct cannot reach slurmdbd; see /var/log/slurm/slurmdbd.log." >&2; exit 1; }
sinfo
