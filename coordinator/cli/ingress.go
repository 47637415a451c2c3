package cli

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

// allocIngressCmd is `gpuaasctl alloc ingress add|rm|list`.
func (a *app) allocIngressCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "ingress",
		Short: "Public ingress of a slice: open, close and list rules (tcp/22 -> a public address:port)",
		Long: "Public ingress maps a public address:port from the site's pool to the slice's private\n" +
			"address and port. The site must declare public addressing (gpuaasctl site ingress);\n" +
			"the ledger hands out the endpoints (never twice) within the tenant's quota, and the\n" +
			"host's agent programs the DNAT and reports the route programmed.",
	}
	list := idCmd(a, "list", "List the slice's public ingress routes", http.MethodGet, "/v1/allocations/", "/ingress", ingressTable)
	add := &cobra.Command{
		Use:     "add ID RULE...",
		Short:   "Open public ingress rules (PROTOCOL/PORT, e.g. tcp/22) on a live slice",
		Example: "  gpuaasctl alloc ingress add a-7f3c9d2e10b4 tcp/22 tcp/8888",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usagef("want ID and at least one RULE (e.g. tcp/22)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := proto.ParseIngressRules(args[1:]); err != nil {
				return usageError{err}
			}
			r, err := a.call(cmd, http.MethodPost, "/v1/allocations/"+pathEscape(args[0])+"/ingress", nil, proto.IngressBody{Rules: args[1:]}, nil)
			if err != nil {
				return err
			}
			return show(a, r, ingressTable)
		},
	}
	rm := &cobra.Command{
		Use:     "rm ID RULE",
		Aliases: []string{"remove"},
		Short:   "Close one public ingress rule and free its public endpoint",
		Example: "  gpuaasctl alloc ingress rm a-7f3c9d2e10b4 tcp/22",
		Args:    exactArgs("ID", "RULE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			rule, err := proto.ParseIngressRule(args[1])
			if err != nil {
				return usageError{err}
			}
			r, err := a.call(cmd, http.MethodDelete, "/v1/allocations/"+pathEscape(args[0])+"/ingress/"+rule.Protocol+"/"+strconv.Itoa(rule.Port), nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, ingressTable)
		},
	}
	c.AddCommand(list, add, rm)
	return c
}

func ingressTable(w *tabwriter.Writer, v proto.IngressView) {
	row(w, "RULE", "PUBLIC", "PRIVATE", "STATE", "REASON")
	for _, r := range v.Routes {
		priv := "-"
		if r.PrivateAddress != "" {
			priv = r.PrivateAddress + ":" + strconv.Itoa(r.Port)
		}
		row(w, r.Rule(), r.Public(), priv, r.State, r.Reason)
	}
}

// siteIngressCmd is `gpuaasctl site ingress SITE ...`.
func (a *app) siteIngressCmd() *cobra.Command {
	var addrs, protocols, allowed []string
	var publicPorts string
	var quota int
	var disable bool
	c := &cobra.Command{
		Use:   "ingress SITE",
		Short: "Declare the site's public addressing for ingress (or withdraw it with --disable)",
		Long: "Declare the pool of public IPv4 addresses the site routes to its slice hosts (or one\n" +
			"address with --public-ports), the protocols and private ports tenants may expose, and\n" +
			"the per-tenant quota of routes. Without a declaration public ingress is refused at the\n" +
			"site. Narrowing or withdrawing it is refused while live routes would no longer fit.\n" +
			"With no flag it shows the site's current declaration.",
		Example: "  gpuaasctl site ingress lab --address 203.0.113.10 --address 203.0.113.11 --allow 22 --allow 8000-8999 --quota 4\n" +
			"  gpuaasctl site ingress lab --address 198.51.100.7 --public-ports 40000-40999 --protocol tcp --protocol udp --allow 1-65535 --quota 8\n" +
			"  gpuaasctl site ingress lab --disable",
		Args: exactArgs("SITE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !slices.ContainsFunc([]string{"address", "public-ports", "protocol", "allow", "quota", "disable"}, cmd.Flags().Changed) {
				r, err := a.call(cmd, http.MethodGet, "/v1/sites/"+pathEscape(args[0]), nil, nil, nil)
				if err != nil {
					return err
				}
				return show(a, r, func(w *tabwriter.Writer, v proto.SiteView) { siteIngressDetail(w, v) })
			}
			body := proto.SiteIngressBody{}
			if disable {
				if len(addrs)+len(allowed) > 0 || publicPorts != "" || cmd.Flags().Changed("quota") {
					return usagef("--disable takes no other flag")
				}
			} else {
				in := &proto.SiteIngress{Addresses: addrs, Protocols: protocols, QuotaPerTenant: quota}
				for _, s := range allowed {
					r, err := proto.ParsePortRange(s)
					if err != nil {
						return usageError{fmt.Errorf("--allow: %w", err)}
					}
					in.AllowedPorts = append(in.AllowedPorts, r)
				}
				if publicPorts != "" {
					r, err := proto.ParsePortRange(publicPorts)
					if err != nil {
						return usageError{fmt.Errorf("--public-ports: %w", err)}
					}
					in.PublicPorts = &r
				}
				if err := in.Validate(args[0]); err != nil {
					return usageError{err}
				}
				body.Ingress = in
			}
			r, err := a.call(cmd, http.MethodPut, "/v1/sites/"+pathEscape(args[0])+"/ingress", nil, body, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, v proto.SiteView) { siteIngressDetail(w, v) })
		},
	}
	f := c.Flags()
	f.StringArrayVar(&addrs, "address", nil, "public IPv4 address of the pool (repeatable)")
	f.StringVar(&publicPorts, "public-ports", "", "public port range handed out on each address, e.g. 40000-40999 (default: a rule's own port)")
	f.StringArrayVar(&protocols, "protocol", []string{proto.IngressTCP}, "protocol tenants may expose: tcp or udp (repeatable)")
	f.StringArrayVar(&allowed, "allow", nil, "private port or range tenants may expose, e.g. 22 or 8000-8999 (repeatable)")
	f.IntVar(&quota, "quota", 4, "live routes one tenant may hold at the site")
	f.BoolVar(&disable, "disable", false, "withdraw the declaration (public ingress refused at the site)")
	return c
}

func siteIngressDetail(w *tabwriter.Writer, v proto.SiteView) {
	row(w, "Site:", v.Name)
	in := v.Ingress
	if in == nil {
		row(w, "Public ingress:", "disabled (the site declares no public addressing)")
		return
	}
	var allowed []string
	for _, r := range in.AllowedPorts {
		allowed = append(allowed, r.String())
	}
	row(w, "Public ingress:", "enabled")
	row(w, "Addresses:", strings.Join(in.Addresses, ", "))
	if in.PublicPorts != nil {
		row(w, "Public ports:", in.PublicPorts.String())
	} else {
		row(w, "Public ports:", "a rule's own port")
	}
	row(w, "Protocols:", strings.Join(in.Protocols, ", "))
	row(w, "Allowed ports:", strings.Join(allowed, ", "))
	row(w, "Quota per tenant:", in.QuotaPerTenant)
}
