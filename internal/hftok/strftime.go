package hftok

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// strftimeNow is transformers' strftime_now(format): the local date and
// time (clock's, time.Now when nil), formatted as Python's strftime
// formats them. Llama 3's templates put today's date in the system prompt
// with it, so a rendering without it would differ from the engine's from
// the first block on.
func strftimeNow(clock func() time.Time) jinja.Value {
	if clock == nil {
		clock = time.Now
	}
	return jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now: want one format string")
		}
		s, err := strftime(clock(), args[0].AsString())
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(s), nil
	})
}

// strftime formats t as Python's time.strftime does in the C locale, for
// the directives chat templates use; another directive is an error.
func strftime(t time.Time, format string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i++; i == len(format) {
			return "", errors.New("strftime_now: format ends with %")
		}
		switch format[i] {
		case 'd':
			pad2(&b, t.Day())
		case 'm':
			pad2(&b, int(t.Month()))
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'y':
			pad2(&b, t.Year()%100)
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'H':
			pad2(&b, t.Hour())
		case 'I':
			pad2(&b, (t.Hour()+11)%12+1)
		case 'M':
			pad2(&b, t.Minute())
		case 'S':
			pad2(&b, t.Second())
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'j':
			d := t.YearDay()
			if d < 100 {
				b.WriteByte('0')
			}
			pad2(&b, d)
		case '%':
			b.WriteByte('%')
		default:
			return "", errors.New("strftime_now: unsupported directive %" + string(format[i]))
		}
	}
	return b.String(), nil
}

func pad2(b *strings.Builder, n int) {
	if n < 10 {
		b.WriteByte('0')
	}
	b.WriteString(strconv.Itoa(n))
}
