// Command kafka runs two sluice routes over Kafka consumer groups under a
// burst far above their capacity: critical orders and sheddable reports,
// each with its own window and workers, dead letters to a Kafka topic.
// It is the NATS quick start (examples/quickstart) on Kafka.
//
//	go run ./examples/kafka
//
// It starts an embedded kfake cluster unless $KAFKA_BROKERS is set
// (host:port[,host:port]), and prints a table per route when orders are all
// settled or after 20 s.
package main
