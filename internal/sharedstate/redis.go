package sharedstate

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/pins"
)

// Core is what sharing needs of the routing core (*balancer.Balancer):
// apply a peer's change, count a peer's load, read its own load.
type Core interface {
	Apply(d balancer.Delta, now time.Time) bool
	SetPeerLoad(peer string, loads []balancer.ReplicaLoad, expires, now time.Time)
	Load() []balancer.ReplicaLoad
}

// Redis shares a core's affinity state with its peers through one Redis
// stream. Publish (the core's Sharer) never blocks; Run does the I/O.
type Redis struct {
	cfg  Config
	id   string
	core Core
	rdb  *redis.Client
	log  *slog.Logger
	now  func() time.Time

	queue chan balancer.Delta

	up                                  atomic.Bool
	published, applied, dropped         atomic.Uint64
	publishErrors, readErrors, badInput atomic.Uint64

	logMu      sync.Mutex
	lastLog    time.Time // last warning about Redis (rate limit)
	suppressed int       // errors not logged since
	downSince  time.Time // zero while up
}

// logEvery is the longest rate of warnings about Redis being unreachable.
const logEvery = 10 * time.Second

// readBlock is how long one XREAD waits for new entries; shutdown waits at
// most about this long for the reader.
const readBlock = time.Second

// New returns a client for cfg (which must be Enabled and valid) that will
// apply peers' changes to core. It connects lazily and starts nothing: the
// caller runs Run.
func New(cfg Config, core Core, logger *slog.Logger, now func() time.Time) (*Redis, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sharedstate: %w", err)
	}
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("sharedstate: state.redis_url: %s", redactErr(err, cfg.RedisURL))
	}
	// Every operation is bounded by op_timeout through its context; no
	// retries inside the client (the next publish or read is the retry).
	opt.DialTimeout = cfg.OpTimeout
	opt.ReadTimeout, opt.WriteTimeout = cfg.OpTimeout, cfg.OpTimeout
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = -1
	opt.PoolSize = 4
	opt.DisableIdentity = true
	quietRedisLog()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	id := cfg.InstanceID
	if id == "" {
		id = defaultInstanceID()
	}
	return &Redis{cfg: cfg, id: id, core: core, rdb: redis.NewClient(opt), log: logger, now: now,
		queue: make(chan balancer.Delta, cfg.QueueSize)}, nil
}

// Attach is what a shell (`serve`, `epp`) does to share bal's state: a
// client for cfg whose changes bal publishes, its metrics registered on reg
// (nil: none). The caller runs Run with its background context.
func Attach(cfg Config, bal *balancer.Balancer, reg prometheus.Registerer, logger *slog.Logger, now func() time.Time) (*Redis, error) {
	s, err := New(cfg, bal, logger, now)
	if err != nil {
		return nil, err
	}
	if reg != nil {
		if err := reg.Register(s); err != nil {
			return nil, fmt.Errorf("sharedstate: metrics: %w", err)
		}
	}
	bal.SetSharer(s)
	return s, nil
}

var quietOnce sync.Once

// quietRedisLog silences go-redis's own logger: its pool errors while
// Redis is down would flood stderr; llmlb logs them once, rate-limited.
func quietRedisLog() {
	quietOnce.Do(func() { redis.SetLogger(discardLogger{}) })
}

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

func defaultInstanceID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// ID is this instance's name among its peers.
func (s *Redis) ID() string { return s.id }

// Up reports whether the last Redis operation succeeded.
func (s *Redis) Up() bool { return s.up.Load() }

// Publish queues a change of the core for the writer. It never blocks:
// when the queue is full the change is dropped and counted (it is a hint;
// the next request of the session publishes its pin again).
func (s *Redis) Publish(d balancer.Delta) {
	if len(d.Blocks) > 0 {
		d.Blocks = append([]uint64(nil), d.Blocks...) // the request's own slice
	}
	select {
	case s.queue <- d:
	default:
		s.dropped.Add(1)
	}
}

// Run writes the core's changes and load, and applies the peers', until ctx
// is cancelled; then it closes the connections and returns nil.
func (s *Redis) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.write(ctx) }()
	go func() { defer wg.Done(); s.read(ctx) }()
	<-ctx.Done()
	err := s.rdb.Close() // unblocks a reader waiting in XREAD
	wg.Wait()
	if err != nil && !errors.Is(err, redis.ErrClosed) {
		return fmt.Errorf("sharedstate: %w", err)
	}
	return nil
}

// maxBatch bounds the changes written in one pipelined round trip.
const maxBatch = 256

// write drains the queue into the stream in pipelined batches and
// publishes the core's load every load_interval. After a failure it drops
// what arrives for a short, growing backoff instead of dialling a dead
// Redis for every request, unless Redis has been seen up since (the
// reader reached it): a pin made just after Redis came back would
// otherwise be lost for good, and the peers would never learn it.
func (s *Redis) write(ctx context.Context) {
	tick := time.NewTicker(s.cfg.LoadInterval)
	defer tick.Stop()
	var retryAt time.Time
	backoff := s.cfg.OpTimeout
	batch := make([]balancer.Delta, 0, maxBatch)
	for {
		batch = batch[:0]
		load := false
		select {
		case <-ctx.Done():
			return
		case d := <-s.queue:
			batch = append(batch, d)
		drain:
			for len(batch) < maxBatch {
				select {
				case d := <-s.queue:
					batch = append(batch, d)
				default:
					break drain
				}
			}
		case <-tick.C:
			if !s.cfg.ShareLoad {
				continue
			}
			load = true
		}
		if s.holdingOff(time.Now(), retryAt) {
			s.dropped.Add(uint64(len(batch)))
			continue
		}
		if err := s.flush(ctx, batch, load); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.dropped.Add(uint64(len(batch)))
			s.publishErrors.Add(1)
			s.failed("publish", err)
			retryAt = time.Now().Add(backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = s.cfg.OpTimeout
		s.published.Add(uint64(len(batch)))
		s.ok()
	}
}

// holdingOff reports whether the writer drops what it has instead of
// writing it: within its backoff after a failure (until retryAt), unless
// Redis has been reached since.
func (s *Redis) holdingOff(now, retryAt time.Time) bool {
	return now.Before(retryAt) && !s.up.Load()
}

// flush writes one batch (and the load, if due) in one round trip.
func (s *Redis) flush(ctx context.Context, batch []balancer.Delta, load bool) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	pipe := s.rdb.Pipeline()
	add := func(values []any) {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: s.cfg.streamKey(), MaxLen: s.cfg.StreamMaxLen, Approx: true, Values: values})
	}
	for _, d := range batch {
		if v := s.encode(d); v != nil {
			add(v)
		}
	}
	if load {
		j, err := json.Marshal(s.core.Load())
		if err != nil {
			return err
		}
		add([]any{"s", s.id, "t", "l", "ttl", s.cfg.LoadTTL.Milliseconds(), "j", j})
	}
	if pipe.Len() == 0 {
		return nil
	}
	_, err := pipe.Exec(ctx)
	return err
}

// encode turns a Delta into a stream entry's fields (nil: nothing to send).
func (s *Redis) encode(d balancer.Delta) []any {
	switch d.Kind {
	case balancer.DeltaPin:
		return []any{"s", s.id, "t", "p", "k", int(d.PinKind), "key", d.Key, "r", d.Replica, "u", d.URL}
	case balancer.DeltaUnpin:
		return []any{"s", s.id, "t", "u", "k", int(d.PinKind), "key", d.Key}
	case balancer.DeltaBlocks:
		h := make([]byte, 8*len(d.Blocks))
		for i, b := range d.Blocks {
			binary.LittleEndian.PutUint64(h[8*i:], b)
		}
		return []any{"s", s.id, "t", "b", "r", d.Replica, "u", d.URL, "h", h}
	}
	return nil
}

// read follows the stream from replay_window ago and applies the peers'
// entries; on an error it waits a growing backoff and resumes after the
// last entry it applied (a restarted Redis starts a new stream, whose ids
// are later).
func (s *Redis) read(ctx context.Context) {
	last := ""
	backoff := s.cfg.OpTimeout
	for ctx.Err() == nil {
		if last == "" {
			start, err := s.startID(ctx)
			if err != nil {
				s.readFailed(ctx, err, &backoff)
				continue
			}
			last = start
		}
		rctx, cancel := context.WithTimeout(ctx, readBlock+s.cfg.OpTimeout)
		streams, err := s.rdb.XRead(rctx, &redis.XReadArgs{Streams: []string{s.cfg.streamKey(), last}, Count: 512, Block: readBlock}).Result()
		cancel()
		if errors.Is(err, redis.Nil) {
			s.ok() // nothing new within readBlock
			continue
		}
		if err != nil {
			s.readFailed(ctx, err, &backoff)
			continue
		}
		backoff = s.cfg.OpTimeout
		s.ok()
		for _, st := range streams {
			for _, m := range st.Messages {
				last = m.ID
				s.apply(m)
			}
		}
	}
}

func (s *Redis) readFailed(ctx context.Context, err error, backoff *time.Duration) {
	if ctx.Err() != nil {
		return
	}
	s.readErrors.Add(1)
	s.failed("read", err)
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	*backoff = min(2**backoff, 2*time.Second)
}

// startID is the stream id replay_window before Redis's clock.
func (s *Redis) startID(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d-0", max(0, t.Add(-s.cfg.ReplayWindow).UnixMilli())), nil
}

// apply applies one peer's stream entry to the core (own entries and
// malformed ones are skipped).
func (s *Redis) apply(m redis.XMessage) {
	str := func(k string) string { v, _ := m.Values[k].(string); return v }
	src := str("s")
	if src == s.id || src == "" {
		return
	}
	now := s.now()
	switch str("t") {
	case "p", "u":
		k, err := strconv.Atoi(str("k"))
		if err != nil || k < int(pins.Session) || k > int(pins.Prefix) || str("key") == "" {
			s.badInput.Add(1)
			return
		}
		d := balancer.Delta{Kind: balancer.DeltaPin, At: now, PinKind: pins.Kind(k), Key: str("key"), Replica: str("r"), URL: str("u")}
		if str("t") == "u" {
			d.Kind = balancer.DeltaUnpin
		}
		s.core.Apply(d, now)
	case "b":
		h := str("h")
		if len(h) == 0 || len(h)%8 != 0 {
			s.badInput.Add(1)
			return
		}
		blocks := make([]uint64, len(h)/8)
		for i := range blocks {
			blocks[i] = binary.LittleEndian.Uint64([]byte(h[8*i : 8*i+8]))
		}
		s.core.Apply(balancer.Delta{Kind: balancer.DeltaBlocks, At: now, Replica: str("r"), URL: str("u"), Blocks: blocks}, now)
	case "l":
		if !s.cfg.ShareLoad {
			return
		}
		ttl, err := strconv.ParseInt(str("ttl"), 10, 64)
		var loads []balancer.ReplicaLoad
		if err != nil || ttl <= 0 || json.Unmarshal([]byte(str("j")), &loads) != nil {
			s.badInput.Add(1)
			return
		}
		// An entry older than its TTL (a replay, a backlog) is stale.
		expires := entryTime(m.ID).Add(time.Duration(ttl) * time.Millisecond)
		if !now.Before(expires) {
			return
		}
		s.core.SetPeerLoad(src, loads, expires, now)
	default:
		s.badInput.Add(1)
		return
	}
	s.applied.Add(1)
}

// entryTime is the wall time in a stream entry id ("<ms>-<seq>").
func entryTime(id string) time.Time {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(n)
}

// ok marks Redis reachable, logging the recovery once.
func (s *Redis) ok() {
	if s.up.Swap(true) {
		return
	}
	s.logMu.Lock()
	down := s.downSince
	s.downSince = time.Time{}
	s.logMu.Unlock()
	if !down.IsZero() {
		s.log.Info("shared state: redis reachable again", slog.Duration("down_for", time.Since(down).Round(time.Millisecond)))
	}
}

// failed marks Redis down and logs at most one warning per logEvery.
func (s *Redis) failed(op string, err error) {
	s.up.Store(false)
	s.logMu.Lock()
	defer s.logMu.Unlock()
	now := time.Now()
	if s.downSince.IsZero() {
		s.downSince = now
	}
	if !s.lastLog.IsZero() && now.Sub(s.lastLog) < logEvery {
		s.suppressed++
		return
	}
	s.log.Warn("shared state: redis unreachable; routing on local state",
		slog.String("op", op), slog.String("error", redactErr(err, s.cfg.RedisURL)), slog.Int("errors_not_logged", s.suppressed))
	s.lastLog, s.suppressed = now, 0
}
