"""The runtime the job stands on: settings, the Spark session (and its JVM's class archive), Kafka
clients, crash points, the metrics endpoint, what /proc says about a process. Imports only
``schemas``; everything above may import it."""
