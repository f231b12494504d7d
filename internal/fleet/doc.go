// Package fleet runs a sluice consumer as a fleet of processes on one Kafka
// consumer group or one JetStream durable, adds and removes processes
// (SIGTERM and SIGKILL) under load, and keeps a ledger of every message:
// lost (must be none), handled again and why (against the settlement
// contract), and what each instance held at most against its window.
//
// The consumer program is examples/fleet, built into a temporary directory
// and run with -report; TestFleet drives it (SLUICE_FLEET=short|full, see
// docs/fleet.md).
package fleet
