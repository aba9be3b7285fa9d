"""adattr's runtime shell: settings, the SparkSession factory, Kafka I/O, broker, CLI."""
