package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"

	"golang.org/x/crypto/ssh"
)

// The guest's SSH server. u-root v0.16's sshd runs an exec request before
// replying to it and never closes the channel, which deadlocks clients
// that wait for the reply before sending stdin EOF (golang.org/x/crypto/ssh
// does) and leaves every session open; the readiness gate runs commands
// with that client. This one replies first, then runs the command with
// /bin/sh -c, sends exit-status and closes the channel, as OpenSSH does.
// Only public-key authentication with the seed's keys is accepted; "shell"
// runs /bin/sh on the channel's stdin (no PTY).

// serveSSH listens on addr and serves until the listener fails.
func serveSSH(ln net.Listener, cfg *ssh.ServerConfig) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		go func() {
			conn, chans, reqs, err := ssh.NewServerConn(c, cfg)
			if err != nil {
				log.Printf("sshd: handshake with %s: %v", c.RemoteAddr(), err)
				return
			}
			log.Printf("sshd: %s logged in with %s", conn.RemoteAddr(), conn.Permissions.Extensions["pubkey-fp"])
			go ssh.DiscardRequests(reqs)
			for nc := range chans {
				if nc.ChannelType() != "session" {
					nc.Reject(ssh.UnknownChannelType, "only session channels")
					continue
				}
				ch, creqs, err := nc.Accept()
				if err != nil {
					log.Printf("sshd: accept channel: %v", err)
					continue
				}
				go session(ch, creqs)
			}
		}()
	}
}

// sshConfig builds the server config from authorized_keys content and a
// fresh ed25519 host key.
func sshConfig(authorizedKeys []byte) (*ssh.ServerConfig, error) {
	allowed := map[string]bool{}
	for len(authorizedKeys) > 0 {
		pk, _, _, rest, err := ssh.ParseAuthorizedKey(authorizedKeys)
		if err != nil {
			break // no more keys (or trailing blank lines)
		}
		allowed[string(pk.Marshal())] = true
		authorizedKeys = rest
	}
	if len(allowed) == 0 {
		return nil, errors.New("no authorized SSH key")
	}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(c ssh.ConnMetadata, pk ssh.PublicKey) (*ssh.Permissions, error) {
			if allowed[string(pk.Marshal())] {
				return &ssh.Permissions{Extensions: map[string]string{"pubkey-fp": ssh.FingerprintSHA256(pk)}}, nil
			}
			return nil, fmt.Errorf("unknown public key for %q", c.User())
		},
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("host key: %w", err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("host key: %w", err)
	}
	cfg.AddHostKey(signer)
	return cfg, nil
}

func session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for req := range reqs {
		var args []string
		switch req.Type {
		case "exec":
			var p struct{ Command string }
			if err := ssh.Unmarshal(req.Payload, &p); err != nil {
				req.Reply(false, nil)
				continue
			}
			args = []string{"-c", p.Command}
		case "shell":
		case "env":
			req.Reply(true, nil) // accepted and ignored
			continue
		default:
			req.Reply(false, nil)
			continue
		}
		req.Reply(true, nil)
		cmd := exec.Command("/bin/sh", args...)
		cmd.Dir = "/"
		cmd.Env = append(os.Environ(), "HOME=/root")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
		status := uint32(0)
		if err := cmd.Run(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() >= 0 {
				status = uint32(ee.ExitCode())
			} else {
				fmt.Fprintf(ch.Stderr(), "sshd: %v\n", err)
				status = 255
			}
		}
		ch.CloseWrite()
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], status)
		ch.SendRequest("exit-status", false, b[:])
		return
	}
}
