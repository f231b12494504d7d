package fleet_test

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// fakeEnv makes the test binary a stand-in instance (see fakeMember).
const fakeEnv = "SLUICE_FLEET_FAKE_MEMBER"

func TestMain(m *testing.M) {
	if os.Getenv(fakeEnv) != "" {
		os.Exit(fakeMember())
	}
	goleak.VerifyTestMain(m)
}

// fakeMember speaks the instance protocol of examples/fleet -report without
// a broker: it handles and settles ids 0..9, reports its window, and exits
// after SIGTERM with its final line.
func fakeMember() int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	fmt.Println("ready")
	for i := range 10 {
		fmt.Printf("h %d 1\ns %d\n", i, i)
	}
	fmt.Println("w 3 2 16 1 7 3")
	<-term
	fmt.Println("x 10 10")
	return 0
}
