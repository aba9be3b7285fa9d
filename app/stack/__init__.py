"""The local stack the operator's tools start: a Kafka broker from Maven jars (plain or SASL_SSL
with ACLs), and a Spark standalone cluster with three Kafka nodes on loopback. Imports the runtime,
never the job or the tools."""
