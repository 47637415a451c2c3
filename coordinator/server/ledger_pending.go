package server

import (
	"context"
	"log/slog"

	"github.com/hashicorp/raft"
)

type ledger struct{ fsm raft.FSM }

func newLedger(*slog.Logger) *ledger { panic("ledger pending") }

type planner struct{}

func newPlanner(*Server) *planner            { return &planner{} }
func (p *planner) run(context.Context)       {}
func (s *Server) pumpOutbox(context.Context) {}
