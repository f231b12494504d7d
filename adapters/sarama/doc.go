// Package saramaadapter runs sluice routes on IBM/sarama consumer groups:
// the embed story for an existing sarama consumer. Its Handler is a
// sarama.ConsumerGroupHandler and a consumer.Source at once, so the
// application's group loop keeps its shape
//
//	h, _ := saramaadapter.NewHandler(saramaadapter.Config{GroupID: group, Client: client})
//	c, _ := consumer.New(consumer.Options{}, consumer.Route{Name: "orders", Source: h, Handler: handle})
//	go func() {
//		for groupCtx.Err() == nil {
//			_ = cg.Consume(groupCtx, topics, h) // as before, with h
//		}
//	}()
//	err := c.Run(ctx) // then stop the group loop and close the group
//
// and the route brings its window, bounded prefetch, retries, dead
// letters, deadlines and per-key ordering to the messages sarama fetches.
//
// What the Handler does with a claim is what sluice's Kafka sources do
// (they share internal/kafkacore):
//
//   - The bound: messages are read from a claim's channel only while the
//     prefetch (the route's window by default: Config.PrefetchMessages and
//     PrefetchBytes) has room, so sarama's fetches stop once its own
//     channels are full. What the process holds is the window, the
//     prefetch and sarama's channels (Handler.Bound counts them:
//     Consumer.ChannelBufferSize per claimed partition). The claims share
//     the prefetch in equal shares and are served to the route round
//     robin, so a partition with a backlog does not starve the others.
//   - Commits: every partition has a watermark; each claim marks the
//     lowest offset handed out and not settled (session.MarkOffset, or
//     ResetOffset when only the map changed) every Config.CommitInterval,
//     with the map of offsets settled above it in the offset metadata.
//     sarama commits the marks (its auto-commit, or session.Commit with
//     Config.Commit) and once more when a session ends. With Config.Client
//     and GroupID set, a claim reads the metadata of the commit it starts
//     from and passes over the offsets a previous owner settled: a restart
//     or a rebalance redoes no completed work.
//   - Revoke grace: when a claim ends (a rebalance, the group closing), its
//     records not handed out are dropped, messages the route holds from it
//     are not started any more (consumer.Revocable: on an ordered route a
//     key's later message never runs here after an earlier one went to
//     the new owner), and ConsumeClaim waits Config.RevokeGrace for those
//     running before its final mark. sarama commits after Cleanup.
//   - Retries: a Nak keeps the message in process, handed out again with
//     Attempt + 1 after its delay (at most Config.LocalRetryMaxDelay),
//     without blocking its partition. There is no retry topic here yet.
//
// Dead letters go to any dlq.Sink; NewMurmur2Partitioner places keys as
// Kafka's Java producer, kafka-go and franz-go do. The group's start
// offset without a commit is sarama's Consumer.Offsets.Initial (sarama's
// default is the newest offset: set sarama.OffsetOldest to read a topic's
// backlog).
package saramaadapter
