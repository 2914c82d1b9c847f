module sagaworks.local/k8s-cluster/probe

go 1.24.0
