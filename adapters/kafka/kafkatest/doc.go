// Package kafkatest gives tests and examples a Kafka cluster: an in-process
// kfake cluster by default, or the real brokers named in $KAFKA_BROKERS
// (comma-separated host:port), so one suite runs on both.
package kafkatest
