package config

// RLS configures the Envoy rate-limit service (YAML rls), served on Config.RLSListen by the
// ingress (internal/rls).
type RLS struct {
	// ConfigDir is the directory of domain files in envoyproxy/ratelimit's YAML format (YAML
	// rls.config_dir; every *.yaml and *.yml file in it, not in subdirectories), reloaded
	// when it changes. Required. Relative paths are taken from the process's working
	// directory. A descriptor there may name one of Rules (rule: NAME) instead of a
	// rate_limit.
	ConfigDir string
	// Reflection serves the gRPC reflection service beside the rate-limit service (YAML
	// rls.reflection), for grpcurl and the like. Default false.
	Reflection bool
}

// rls reads rls_listen and the rls section: either both or neither.
func (b *builder) rls(c *Config, raw *rawConfig) {
	switch {
	case raw.RLSListen == nil && raw.RLS == nil:
		return
	case raw.RLSListen == nil:
		b.p.add("", "rls_listen", "rls_listen: required with an rls section (the host:port the rate-limit service listens on)")
		return
	case raw.RLS == nil:
		b.p.add("", "rls", "rls: required with rls_listen: rls: {config_dir: DIR}, the directory of domain files")
		return
	}
	c.RLSListen = b.addr("rls_listen", raw.RLSListen, "")
	c.RLS = &RLS{
		ConfigDir:  b.text("", "rls.config_dir", raw.RLS.ConfigDir, ""),
		Reflection: b.boolean("", "rls.reflection", raw.RLS.Reflection),
	}
	if c.RLS.ConfigDir == "" {
		b.p.add("", "rls.config_dir", "rls.config_dir: required: the directory of domain files (envoyproxy/ratelimit's YAML format)")
	}
}
