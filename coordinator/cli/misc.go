package cli

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
)

func (a *app) availabilityCmd() *cobra.Command {
	c := listCmd(a, "availability", "Free GPUs per region and SKU, and the largest request that fits now", "/v1/availability",
		cursorPage("REGION/SKU"), []filter{{"region", "only this region"}, {"sku", "only this SKU"}},
		func(w *tabwriter.Writer, l proto.List[proto.Availability]) {
			row(w, "REGION", "SKU", "SHAPE", "FREE-GPUS", "FREE-NODES", "LARGEST", "PLACEABLE")
			for _, x := range l.Items {
				region := x.Region
				if x.RegionDisabled {
					region += " (disabled)"
				}
				var counts []string
				for _, n := range x.Placeable {
					counts = append(counts, strconv.Itoa(n))
				}
				row(w, region, x.SKU, x.CapacityShape, x.FreeGPUs, x.FreeNodes, x.LargestPlaceable, strings.Join(counts, ","))
			}
		})
	c.Aliases = []string{"avail"}
	return c
}

func (a *app) usageCmd() *cobra.Command {
	return listCmd(a, "usage", "Usage records for billing export", "/v1/usage", plainPage, []filter{
		{"allocation", "only this allocation"},
		{"since", "only records open or ended at or after this RFC 3339 time"},
	}, func(w *tabwriter.Writer, l proto.List[proto.UsageRecord]) {
		row(w, "ALLOCATION", "SHAPE", "SKU", "GPUS", "NODE", "START", "END")
		for _, u := range l.Items {
			row(w, u.AllocationID, u.Shape, u.SKU, u.GPUCount, u.NodeID, ts(u.Start), tsp(u.End))
		}
	})
}

func (a *app) regionCmd() *cobra.Command {
	c := &cobra.Command{Use: "region", Aliases: []string{"regions"}, Short: "List and set regions"}
	c.AddCommand(pagedList(a, "List regions", "/v1/regions", func(w *tabwriter.Writer, l proto.List[proto.Region]) {
		row(w, "NAME", "DISABLED")
		for _, x := range l.Items {
			row(w, x.Name, yesNo(x.Disabled))
		}
	}))
	var disabled bool
	set := &cobra.Command{
		Use:   "set NAME",
		Short: "Create or update a region (admin)",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.call(cmd, http.MethodPut, "/v1/regions/"+pathEscape(args[0]), nil, proto.RegionPutBody{Disabled: disabled}, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, x proto.Region) {
				row(w, "NAME", "DISABLED")
				row(w, x.Name, yesNo(x.Disabled))
			})
		},
	}
	set.Flags().BoolVar(&disabled, "disabled", false, "take no placements in this region")
	c.AddCommand(set)
	return c
}

func (a *app) poolCmd() *cobra.Command {
	c := &cobra.Command{Use: "pool", Aliases: []string{"pools"}, Short: "List and set pools"}
	c.AddCommand(pagedList(a, "List pools", "/v1/pools", func(w *tabwriter.Writer, l proto.List[proto.Pool]) {
		row(w, "NAME", "REGION")
		for _, x := range l.Items {
			row(w, x.Name, x.Region)
		}
	}))
	var region string
	set := &cobra.Command{
		Use:   "set NAME --region REGION",
		Short: "Create or update a pool (admin)",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if region == "" {
				return usagef("--region is required")
			}
			r, err := a.call(cmd, http.MethodPut, "/v1/pools/"+pathEscape(args[0]), nil, proto.PoolPutBody{Region: region}, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, x proto.Pool) {
				row(w, "NAME", "REGION")
				row(w, x.Name, x.Region)
			})
		},
	}
	set.Flags().StringVar(&region, "region", "", "region of the pool (required)")
	c.AddCommand(set)
	return c
}

func peersTable(w *tabwriter.Writer, l proto.List[api.Peer]) {
	row(w, "ID", "RAFT", "HTTP", "VOTER", "LEADER")
	for _, p := range l.Items {
		row(w, p.ID, p.RaftAddr, p.HTTPAddr, yesNo(p.Voter), yesNo(p.Leader))
	}
}

func (a *app) operatorCmd() *cobra.Command {
	c := &cobra.Command{Use: "operator", Short: "Raft peer set: list, add or remove a voter, transfer leadership, mint join tokens; the gossip keyring"}
	c.AddCommand(a.gossipKeyCmd())
	var jtServer string
	var jtTTL time.Duration
	jt := &cobra.Command{
		Use:   "join-token [--server-id ID] [--ttl 1h]",
		Short: "Mint a single-use join token a new coordinator presents with -join-token-file (admin; shown once)",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if jtTTL <= 0 || jtTTL > proto.MaxJoinTokenTTL || jtTTL%time.Second != 0 {
				return usagef("--ttl %s must be whole seconds within (0, %s]", jtTTL, proto.MaxJoinTokenTTL)
			}
			if jtServer != "" {
				if err := proto.ValidateID("--server-id", jtServer); err != nil {
					return usageError{err}
				}
			}
			r, err := a.call(cmd, http.MethodPost, "/v1/operator/join-tokens", nil,
				proto.JoinTokenCreateBody{ServerID: jtServer, TTLSeconds: int(jtTTL / time.Second)}, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, t proto.JoinTokenResponse) {
				row(w, "Token:", t.Token)
				if t.ServerID != "" {
					row(w, "Server:", t.ServerID)
				}
				row(w, "Expires:", t.ExpiresAt.Format(time.RFC3339))
			})
		},
	}
	jt.Flags().StringVar(&jtServer, "server-id", "", "admit only the server with this ID")
	jt.Flags().DurationVar(&jtTTL, "ttl", proto.DefaultJoinTokenTTL, "lifetime of the token (at most 24h)")
	c.AddCommand(jt)
	var peersPage func(map[string]string) map[string]string
	peers := &cobra.Command{
		Use:   "peers",
		Short: "List the Raft configuration",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listPage(a, cmd, "/v1/operator/peers", peersPage(nil), peersTable)
		},
	}
	peersPage = pageFlags(peers, cursorPage("server ID"))
	c.AddCommand(peers, &cobra.Command{
		Use:   "add ID RAFT-ADDR HTTP-ADDR",
		Short: "Add a voter (admin)",
		Args:  exactArgs("ID", "RAFT-ADDR", "HTTP-ADDR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, addr := range args[1:] {
				if _, _, err := net.SplitHostPort(addr); err != nil {
					return usagef("%q is not host:port", addr)
				}
			}
			r, err := a.call(cmd, http.MethodPost, "/v1/operator/peers", nil, proto.PeerAddBody{ID: args[0], RaftAddr: args[1], HTTPAddr: args[2]}, nil)
			if err != nil {
				return err
			}
			return show(a, r, peersTable)
		},
	}, idCmd(a, "remove", "Remove a server from the Raft configuration (admin)", http.MethodDelete, "/v1/operator/peers/", "", peersTable),
		&cobra.Command{
			Use:   "transfer [ID]",
			Short: "Hand leadership to a voter (any up-to-date one without ID) (admin)",
			Args: func(_ *cobra.Command, args []string) error {
				if len(args) > 1 {
					return usagef("expected at most one argument: ID")
				}
				return nil
			},
			RunE: func(cmd *cobra.Command, args []string) error {
				var body any
				if len(args) == 1 {
					body = proto.TransferLeadershipBody{ID: args[0]}
				}
				r, err := a.call(cmd, http.MethodPost, "/v1/operator/transfer-leadership", nil, body, nil)
				if err != nil {
					return err
				}
				return show(a, r, peersTable)
			},
		})
	return c
}

func (a *app) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the replica's leadership view and applied index",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := a.call(cmd, http.MethodGet, "/v1/status", nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, s proto.Status) {
				row(w, "Leader:", yesNo(s.IsLeader))
				row(w, "Leader address:", s.LeaderHTTPAddr)
				row(w, "Index:", s.Index)
				for _, warn := range s.Warnings {
					row(w, "WARNING:", warn)
				}
			})
		},
	}
}

// tokenCmd makes API tokens: offline tokens-file entries (generate) or
// replicated tokens through the API (create, list, revoke; admin).
func (a *app) tokenCmd() *cobra.Command {
	c := &cobra.Command{Use: "token", Short: "Make API tokens: tokens-file entries (offline) or replicated ones through the API"}
	var cname, crole string
	create := &cobra.Command{
		Use:   "create --name NAME --role admin|operator|viewer|tenant",
		Short: "Make a token through the API (admin): its hash is replicated, the token is printed once",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := api.ParseRole(crole); err != nil {
				return usageError{err}
			}
			if err := proto.ValidateID("--name", cname); err != nil {
				return usageError{err}
			}
			r, err := a.call(cmd, http.MethodPost, "/v1/operator/tokens", nil, proto.APITokenCreateBody{Name: cname, Role: crole}, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, t proto.APITokenCreated) {
				row(w, "Name:", t.Name)
				row(w, "Role:", t.Role)
				row(w, "Token:", t.Token)
				row(w, "Created:", ts(t.CreatedAt))
				fmt.Fprintln(a.errOut, "the token is shown once: keep it (export GPUAAS_TOKEN=...)")
			})
		},
	}
	create.Flags().StringVar(&cname, "name", "", "the principal: owner of what the token creates")
	create.Flags().StringVar(&crole, "role", "tenant", "role: admin, operator, viewer or tenant (its own allocations and the catalog only)")
	revoke := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke the token of NAME made through the API (admin)",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.call(cmd, http.MethodDelete, "/v1/operator/tokens/"+pathEscape(args[0]), nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, t proto.APIToken) {
				row(w, "Name:", t.Name)
				row(w, "Role:", t.Role)
				row(w, "Revoked:", tsp(t.RevokedAt))
			})
		},
	}
	list := pagedList(a, "List the tokens made through the API (never the tokens file's, never a hash)", "/v1/operator/tokens",
		func(w *tabwriter.Writer, l proto.List[proto.APIToken]) {
			row(w, "NAME", "ROLE", "BY", "CREATED", "REVOKED")
			for _, t := range l.Items {
				row(w, t.Name, t.Role, t.By, ts(t.CreatedAt), tsp(t.RevokedAt))
			}
		})
	c.AddCommand(create, list, revoke)
	var name, role string
	gen := &cobra.Command{
		Use:   "generate --name NAME --role admin|operator|viewer|tenant",
		Short: "Generate a token; prints it and the tokens-file entry that holds only its SHA-256",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := api.ParseRole(role); err != nil {
				return usageError{err}
			}
			if err := proto.ValidateID("--name", name); err != nil {
				return usageError{err}
			}
			tok, err := api.GenerateToken()
			if err != nil {
				return err
			}
			entry := api.TokenEntry{Name: name, Role: role, SHA256: api.HashToken(tok)}
			b, err := json.Marshal(entry)
			if err != nil {
				return fmt.Errorf("encode entry: %w", err)
			}
			if a.output == "json" {
				out, err := json.MarshalIndent(map[string]any{"token": tok, "entry": entry}, "", "  ")
				if err != nil {
					return fmt.Errorf("encode: %w", err)
				}
				_, err = fmt.Fprintln(a.out, string(out))
				return err
			}
			fmt.Fprintf(a.out, "token: %s\nentry: %s\n", tok, b)
			return nil
		},
	}
	gen.Flags().StringVar(&name, "name", "", "token name (shown in logs and as default allocation owner)")
	gen.Flags().StringVar(&role, "role", "viewer", "role: admin, operator, viewer or tenant (its own allocations and the catalog only)")
	c.AddCommand(gen)
	return c
}

// pagedList is a "list" command of a paged route: --limit and --after
// pass through, and the next page's cursor is named.
func pagedList[T any](a *app, short, path string, table func(w *tabwriter.Writer, l proto.List[T])) *cobra.Command {
	return listCmd(a, "list", short, path, plainPage, nil, table)
}
