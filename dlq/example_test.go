package dlq_test

import (
	"fmt"

	"github.com/sluice-go/sluice/dlq"
)

func ExampleDecode() {
	l := &dlq.Letter{Value: []byte(`{"id":7}`), Class: dlq.ClassPermanent, Err: "unknown currency", Attempts: 1,
		Origin: dlq.Origin{Topic: "orders.created", Stream: "ORDERS", Sequence: 7, Partition: -1}}
	headers := l.EnvelopeHeaders() // what an adapter's Sink publishes

	back, err := dlq.Decode(nil, l.Value, headers)
	if err != nil {
		panic(err)
	}
	fmt.Println(back.Class, back.Err, back.Origin.Stream, back.Origin.Sequence)
	// Output: permanent unknown currency ORDERS 7
}
