package slice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"libvirt.org/go/libvirt"
)

// ConsoleHypervisor is a Hypervisor that opens a domain's serial console
// (Libvirt is one).
type ConsoleHypervisor interface {
	OpenConsole(ctx context.Context, name string) (io.ReadWriteCloser, error)
}

// OpenConsole opens the serial console of an allocation's domain
// (agent/console.Opener): the domain must be defined by this runtime and
// its allocation provisioning or active.
func (r *Runtime) OpenConsole(ctx context.Context, alloc string) (io.ReadWriteCloser, error) {
	ch, ok := r.d.Hypervisor.(ConsoleHypervisor)
	if !ok {
		return nil, errors.New("open console: this hypervisor has no console streams")
	}
	rec, ok, err := r.d.Journal.Get(alloc)
	if err != nil {
		return nil, fmt.Errorf("open console of %s: %w", alloc, err)
	}
	if !ok || !rec.Defined || (rec.Phase != PhaseActive && rec.Phase != PhaseProvisioning) {
		return nil, fmt.Errorf("open console of %s: no running domain of this allocation on this host", alloc)
	}
	return ch.OpenConsole(ctx, rec.Domain)
}

// OpenConsole opens the domain's first console (its serial port) as a
// libvirt stream (virDomainOpenConsole). FORCE takes the console over
// from a stale holder (an earlier agent process): the agent multiplexes
// its own sessions over one stream.
func (l *Libvirt) OpenConsole(_ context.Context, name string) (io.ReadWriteCloser, error) {
	c, err := l.connect()
	if err != nil {
		return nil, err
	}
	d, err := c.LookupDomainByName(name)
	if err != nil {
		return nil, fmt.Errorf("open console of domain %s: %w", name, err)
	}
	defer d.Free()
	st, err := c.NewStream(0)
	if err != nil {
		return nil, fmt.Errorf("open console of domain %s: new stream: %w", name, err)
	}
	if err := d.OpenConsole("", st, libvirt.DOMAIN_CONSOLE_FORCE); err != nil {
		st.Free()
		return nil, fmt.Errorf("open console of domain %s: %w", name, err)
	}
	return &consoleStream{st: st, name: name}, nil
}

// consoleStream is a blocking libvirt stream as an io.ReadWriteCloser.
type consoleStream struct {
	st   *libvirt.Stream
	name string

	once sync.Once
	free sync.Once
	mu   sync.Mutex
	done bool
}

func (s *consoleStream) Read(p []byte) (int, error) {
	for {
		n, err := s.st.Recv(p)
		if err != nil {
			// The stream ended (EOF, Abort by Close, or an error): free
			// it here, where no Recv is in flight any more.
			s.free.Do(func() { _ = s.st.Free() })
			if s.closed() {
				return 0, io.EOF
			}
			return 0, err
		}
		if n >= 0 {
			return n, nil
		}
		// -2/-3 only come from non-blocking streams or holes: retry.
	}
}

func (s *consoleStream) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := s.st.Send(p[done:])
		if err != nil {
			return done, fmt.Errorf("console of domain %s: %w", s.name, err)
		}
		if n > 0 {
			done += n
		}
	}
	return done, nil
}

func (s *consoleStream) closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done
}

// Close aborts the stream: a blocked Recv returns, and the reader frees
// the stream.
func (s *consoleStream) Close() error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		s.done = true
		s.mu.Unlock()
		err = s.st.Abort()
	})
	return err
}
