//go:build unix

package redistest

import "syscall"

// Stall stops the node at addr (SIGSTOP), as a stalled process or a
// congested link would: it reads and answers nothing, and what its master
// sends it piles up in the master's buffers. resume (SIGCONT) lets it go
// on; a stalled node can still be killed.
func (c *Cluster) Stall(addr string) (resume func()) {
	c.t.Helper()
	n := c.Node(addr)
	if n.cmd == nil {
		c.t.Fatalf("stall: %s is not running", addr)
	}
	p := n.cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		c.t.Fatalf("stall %s: %v", addr, err)
	}
	return func() { _ = p.Signal(syscall.SIGCONT) }
}
