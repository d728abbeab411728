"""What the replication does with the replicas on this host, whether one
host holds the whole group (llft/local_group.py) or each host one member
of it (llft/cluster/member.py): the parts written once for both."""
