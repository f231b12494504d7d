package natstest

import (
	"net"
	"sync"
)

// Proxy forwards TCP connections from its own address to a server, so a
// test can hold back what the server sends (HoldReplies) or what clients
// send (HoldSends) and cut every connection (Cut) without touching the
// server. Clients connect to URL.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	hold  bool // server to clients
	holdS bool // clients to server
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy listens on 127.0.0.1 and forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// URL is the nats:// address clients use.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

// HoldReplies stops forwarding from the server to clients (what the server
// sends waits in the proxy) until Release; client to server traffic still
// flows.
func (p *Proxy) HoldReplies() {
	p.mu.Lock()
	p.hold = true
	p.mu.Unlock()
}

// HoldSends stops forwarding from clients to the server (what clients send
// waits in the proxy, in order) until Release; server to client traffic
// still flows.
func (p *Proxy) HoldSends() {
	p.mu.Lock()
	p.holdS = true
	p.mu.Unlock()
}

// Release resumes forwarding in both directions.
func (p *Proxy) Release() {
	p.mu.Lock()
	p.hold, p.holdS = false, false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Cut closes every forwarded connection; clients reconnect through the
// proxy. Held data is dropped with its connection.
func (p *Proxy) Cut() {
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Close stops the proxy and cuts every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.Release()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(s, c, false)
		go p.pipe(c, s, true)
	}
}

// pipe copies src to dst; it waits while its direction is held.
func (p *Proxy) pipe(dst, src net.Conn, fromServer bool) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for fromServer && p.hold || !fromServer && p.holdS {
				if _, open := p.conns[src]; !open {
					break
				}
				p.cond.Wait()
			}
			_, open := p.conns[src]
			p.mu.Unlock()
			if !open {
				return
			}
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or closed: the defer closes the other side
		}
	}
}
