for aggregate in {{topics}}; do
