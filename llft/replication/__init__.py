"""What the replication does with the replicas on this host: the group on
one host (group.py and the files beside it), and the parts a member of a
group across hosts (llft/cluster/member.py) shares with it."""
