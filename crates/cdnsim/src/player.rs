//! A live-video viewer's playback buffer under piecewise-constant download
//! rates, and the QoE it ends with (the paper's metrics: start-up delay,
//! buffering ratio, buffering events, playback ratio).
//!
//! The buffer holds seconds of video. It fills at `rate / bitrate`
//! seconds a second and, while the video plays, drains at one. Playback
//! starts once it holds `start` seconds, stalls when it runs empty, and
//! resumes at `start` again. A live stream cannot be fetched ahead of its
//! live edge: below `edge` seconds the viewer downloads as fast as it is
//! let (its demand is its line), at the edge it needs exactly the bitrate.
//! [`Player::next_event`] says when the state would change under the
//! current rate, so that a simulator can plan it.

/// A viewer's buffer and counters.
#[derive(Clone, Debug)]
pub struct Player {
    bitrate: f64,
    line: f64,
    start: f64,
    edge: f64,
    arrived: f64,
    t: f64,
    rate: f64,
    buffer: f64,
    playing: bool,
    started: Option<f64>,
    stalled_s: f64,
    stalls: u32,
    bits: f64,
}

/// How a session went.
#[derive(Clone, Debug, PartialEq)]
pub struct Qoe {
    /// Arrival to the first frame played (the whole session if none was).
    pub startup_delay_s: f64,
    /// Time stalled after playback started, over the time since it
    /// started.
    pub buffering_ratio: f64,
    /// Stalls after playback started.
    pub buffering_events: u32,
    /// Bits downloaded over what the session's length at the bitrate
    /// takes (1: the stream kept up).
    pub playback_ratio: f64,
    pub started: bool,
}

/// Times are equal within this (seconds).
const EPS: f64 = 1e-9;

impl Player {
    /// A viewer arriving at `t` for a stream of `bitrate` (bits/s) on a
    /// line of `line` (bits/s), starting at `start` seconds buffered, at
    /// most `edge` seconds ahead.
    pub fn new(t: f64, bitrate: f64, line: f64, start: f64, edge: f64) -> Player {
        Player { bitrate, line, start, edge: edge.max(start), arrived: t, t, rate: 0.0, buffer: 0.0, playing: false, started: None, stalled_s: 0.0, stalls: 0, bits: 0.0 }
    }

    /// What the viewer would download at now: its line below the live
    /// edge, the bitrate at it.
    pub fn demand(&self) -> f64 {
        if self.buffer >= self.edge - EPS {
            self.bitrate.min(self.line)
        } else {
            self.line
        }
    }

    /// The download rate it has now (bits/s).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Seconds of video buffered.
    pub fn buffer(&self) -> f64 {
        self.buffer
    }

    /// Whether the video is playing.
    pub fn playing(&self) -> bool {
        self.playing
    }

    /// The time of the next change of state (start, stall, resume, live
    /// edge reached) under the current rate; `None` if none comes.
    pub fn next_event(&self) -> Option<f64> {
        let fill = self.rate / self.bitrate;
        let dt = if !self.playing {
            (fill > 0.0).then(|| (self.start - self.buffer).max(0.0) / fill)
        } else if fill < 1.0 - EPS {
            Some(self.buffer / (1.0 - fill))
        } else if fill > 1.0 + EPS && self.buffer < self.edge - EPS {
            Some((self.edge - self.buffer) / (fill - 1.0))
        } else {
            None
        };
        dt.map(|d| self.t + d)
    }

    /// Advance to time `t` under the current rate, through every change
    /// of state on the way.
    pub fn advance(&mut self, t: f64) {
        while self.t < t - EPS {
            let until = self.next_event().filter(|&e| e <= t).unwrap_or(t);
            let dt = until - self.t;
            let fill = self.rate / self.bitrate;
            self.bits += self.rate * dt;
            if self.playing {
                self.buffer = (self.buffer + (fill - 1.0) * dt).clamp(0.0, self.edge);
            } else {
                self.buffer = (self.buffer + fill * dt).min(self.edge);
                if self.started.is_some() {
                    self.stalled_s += dt;
                }
            }
            self.t = until;
            // The change of state at `until`, if it is one.
            if !self.playing && self.buffer >= self.start - EPS && self.rate > 0.0 {
                self.playing = true;
                self.started.get_or_insert(self.t);
            } else if self.playing && self.buffer <= EPS && fill < 1.0 - EPS {
                self.playing = false;
                self.buffer = 0.0;
                self.stalls += 1;
            }
        }
        self.t = self.t.max(t);
    }

    /// From time `t` on, download at `rate` (bits/s).
    pub fn set_rate(&mut self, t: f64, rate: f64) {
        self.advance(t);
        self.rate = rate.max(0.0);
    }

    /// The session ends at `t`: its QoE.
    pub fn finish(&mut self, t: f64) -> Qoe {
        self.advance(t);
        let length = (t - self.arrived).max(EPS);
        let (startup, since) = match self.started {
            Some(s) => (s - self.arrived, (t - s).max(EPS)),
            None => (length, EPS),
        };
        Qoe {
            startup_delay_s: startup,
            buffering_ratio: if self.started.is_some() { self.stalled_s / since } else { 0.0 },
            buffering_events: self.stalls,
            playback_ratio: self.bits / (self.bitrate * length),
            started: self.started.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    /// Drive a player by its own events and a script of rate changes.
    fn run(p: &mut Player, script: &[(f64, f64)], end: f64) -> Qoe {
        let mut i = 0;
        loop {
            let next_script = script.get(i).map(|s| s.0);
            let next = [p.next_event(), next_script].into_iter().flatten().fold(end, f64::min);
            if next >= end {
                return p.finish(end);
            }
            if next_script == Some(next) {
                p.set_rate(next, script[i].1);
                i += 1;
            } else {
                p.advance(next);
                // At the live edge the viewer asks for its bitrate only.
                let d = p.demand();
                if p.rate > d {
                    p.set_rate(next, d);
                }
            }
        }
    }

    #[test]
    fn three_scripted_viewers() {
        // A fast line: 2 s of 5 Mb/s video at 25 Mb/s take 0.4 s; the
        // buffer then grows 4 s a second to the 10 s edge (at 2.4 s), and
        // the viewer follows the stream at 5 Mb/s: 60 s, no stall.
        let mut a = Player::new(0.0, 5e6, 25e6, 2.0, 10.0);
        let qa = run(&mut a, &[(0.0, 25e6)], 60.0);
        assert!(close(qa.startup_delay_s, 0.4), "{qa:?}");
        assert_eq!((qa.buffering_events, qa.buffering_ratio), (0, 0.0));
        assert!(close(qa.playback_ratio, (25e6 * 2.4 + 5e6 * 57.6) / (5e6 * 60.0)), "{qa:?}");
        // Half the bitrate: starts at 4 s, runs dry at 8 s, refills 4 s,
        // plays from 12 to 16 s, stalls again: at 20 s, 2 stalls and 8 of
        // the 16 s since the start spent waiting.
        let mut b = Player::new(0.0, 5e6, 25e6, 2.0, 10.0);
        let qb = run(&mut b, &[(0.0, 2.5e6)], 20.0);
        assert!(close(qb.startup_delay_s, 4.0), "{qb:?}");
        assert_eq!(qb.buffering_events, 2);
        assert!(close(qb.buffering_ratio, 0.5), "{qb:?}");
        assert!(close(qb.playback_ratio, 0.5));
        // Nothing until 3 s (a cache booting), then the full line: starts
        // at 3.4 s; arrived at 1 s, so a start-up delay of 2.4 s.
        let mut c = Player::new(1.0, 5e6, 25e6, 2.0, 10.0);
        let qc = run(&mut c, &[(3.0, 25e6)], 30.0);
        assert!(close(qc.startup_delay_s, 2.4), "{qc:?}");
        assert_eq!(qc.buffering_events, 0);
        // A viewer who never gets a bit: never started, the whole session
        // as its start-up delay.
        let mut d = Player::new(0.0, 1e6, 25e6, 2.0, 10.0);
        let qd = d.finish(5.0);
        assert!(!qd.started && close(qd.startup_delay_s, 5.0) && qd.playback_ratio == 0.0);
    }

    #[test]
    fn bytes_are_conserved_across_rate_changes() {
        // However the rate changes, the bits counted are the integral of
        // the rate, and the buffer never exceeds the edge or goes negative.
        let mut p = Player::new(0.0, 8e6, 25e6, 2.0, 6.0);
        let script = [(0.0, 10e6), (1.5, 3e6), (7.0, 25e6), (9.0, 0.0), (12.0, 8e6), (20.0, 12e6)];
        let mut integral = 0.0;
        for w in script.windows(2) {
            integral += w[0].1 * (w[1].0 - w[0].0);
        }
        integral += 12e6 * (30.0 - 20.0);
        for &(t, r) in &script {
            p.set_rate(t, r);
            assert!((0.0..=6.0 + 1e-9).contains(&p.buffer()));
        }
        let q = p.finish(30.0);
        assert!((q.playback_ratio * 8e6 * 30.0 - integral).abs() < 1.0, "{q:?}");
    }
}
