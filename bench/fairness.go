package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/seckill/seckill/bench/internal/fair"
	"github.com/seckill/seckill/bench/internal/load"
	"github.com/seckill/seckill/conf"
)

// runFairness is `bench fairness`: the same crowd (bots among polite
// clients) against two fresh sales of equal stock, one whose purchases the
// proxies put through a waiting room and one they do not, in one run; it
// prints who won the units in each.
func runFairness(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench fairness", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", conf.DefaultPath, "configuration file ([bench] targets and admin_url; $SECKILL_* override it)")
	targets := fs.String("targets", "", "comma-separated proxy URLs (default: [bench] targets)")
	adminURL := fs.String("admin-url", "", "backend URL the sales are created through (default: [bench] admin_url)")
	token := fs.String("admin-token", "", "admin bearer token (default: [backend] admin_token or admin_token_file, $SECKILL_ADMIN_TOKEN)")
	roomID := fs.Int64("room-activity", 0, "activity id whose purchases a rule with a waiting_room serves (required)")
	plainID := fs.Int64("plain-activity", 0, "activity id whose purchases no waiting room serves (0: skip the room-off crowd)")
	stock := fs.Int("stock", 100, "units of each sale")
	polite := fs.Int("polite", 1000, "clients that ask once, then poll as Retry-After tells")
	bots := fs.Int("bots", 50, "clients that retry every -bot-every, ignore Retry-After and drop the room's ticket")
	spread := fs.Duration("spread", 2*time.Second, "arrivals spread over this")
	botEvery := fs.Duration("bot-every", 50*time.Millisecond, "a bot's pace")
	timeout := fs.Duration("timeout", time.Minute, "a client still not answered 202 or sold_out by then gives up")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("fairness: unexpected arguments: %v", fs.Args())
	}
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "config" })
	cfg, err := loadConfig(*path, set)
	if err != nil {
		return err
	}
	if *roomID <= 0 {
		return errors.New("fairness: -room-activity is required: the id of a sale whose purchases a rule with a waiting_room serves")
	}
	if *stock <= 0 || *polite < 0 || *bots < 0 || *polite+*bots == 0 || *spread < 0 || *botEvery <= 0 || *timeout <= 0 {
		return errors.New("fairness: -stock, -bot-every and -timeout must be positive, -polite and -bots not negative and not both 0")
	}
	tg := cfg.Bench.Targets
	if *targets != "" {
		tg = strings.Split(*targets, ",")
	}
	admin := cfg.Bench.AdminURL
	if *adminURL != "" {
		admin = *adminURL
	}
	if *token == "" {
		if *token, err = cfg.Backend.ReadAdminToken(); err != nil {
			return err
		}
	}
	crowds := []struct {
		label string
		id    int64
	}{{"room on", *roomID}, {"room off", *plainID}}
	fmt.Fprintf(stdout, "fairness: %d polite clients and %d bots (every %v, ignoring Retry-After, dropping tickets) over %v; %d units each\n",
		*polite, *bots, *botEvery, *spread, *stock)
	for k, c := range crowds {
		if c.id <= 0 {
			continue
		}
		now := time.Now()
		if err := load.CreateSale(ctx, admin, *token, load.Sale{ID: c.id, Stock: *stock, PerUserLimit: 1,
			StartsAt: now.Add(-time.Second), EndsAt: now.Add(time.Hour)}); err != nil {
			return fmt.Errorf("fairness: %s: %w", c.label, err)
		}
		res, err := fair.Run(ctx, fair.Config{Targets: tg, ActivityID: c.id, Polite: *polite, Bots: *bots, Spread: *spread,
			BotEvery: *botEvery, Timeout: *timeout, Tag: k + 1})
		if err != nil {
			return fmt.Errorf("fairness: %s: %w", c.label, err)
		}
		fair.Summarize(res).Write(stdout, fmt.Sprintf("%s (activity %d)", c.label, c.id))
	}
	return nil
}
