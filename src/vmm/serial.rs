//! COM1 (ports 0x3F8-0x3FF): a transmit-only 16550 whose bytes go to gpupass's stdout.
//!
//! 16550 register facts used here: offset 0 is the transmit holding register (or the divisor
//! latch low byte while LCR bit 7, DLAB, is set), offset 3 the line control register, offset 5
//! the line status register whose bits 5 and 6 (THR empty, transmitter empty) tell a driver it
//! may send. This UART is always ready, so firmware need not poll it (one VM exit per byte
//! instead of two).

use std::io::Write;

pub(crate) const COM1: u16 = super::protocol::PORT_SERIAL;
/// Bytes of console output kept for the report; beyond this the transcript is cut.
pub(crate) const TRANSCRIPT_LIMIT: usize = 1 << 20;

pub(crate) struct Serial<'a> {
    sink: Option<&'a mut dyn Write>,
    transcript: Vec<u8>,
    truncated: bool,
    lcr: u8,
    mcr: u8,
    scratch: u8,
    ier: u8,
}

impl<'a> Serial<'a> {
    /// `sink` receives every byte as the guest writes it (None: keep the transcript only).
    pub(crate) fn new(sink: Option<&'a mut dyn Write>) -> Serial<'a> {
        Serial {
            sink,
            transcript: Vec::new(),
            truncated: false,
            lcr: 0x03,
            mcr: 0,
            scratch: 0,
            ier: 0,
        }
    }

    pub(crate) fn claims(port: u16) -> bool {
        (COM1..COM1 + 8).contains(&port)
    }

    fn dlab(&self) -> bool {
        self.lcr & 0x80 != 0
    }

    pub(crate) fn write(&mut self, port: u16, value: u8) {
        match port - COM1 {
            0 if !self.dlab() => self.transmit(value),
            1 if !self.dlab() => self.ier = value & 0x0f,
            3 => self.lcr = value,
            4 => self.mcr = value & 0x1f,
            7 => self.scratch = value,
            _ => {} // divisor latch, FCR: nothing to model
        }
    }

    pub(crate) fn read(&self, port: u16) -> u8 {
        match port - COM1 {
            1 if !self.dlab() => self.ier,
            2 => 0x01, // IIR: no interrupt pending
            3 => self.lcr,
            4 => self.mcr,
            5 => 0x60, // LSR: THR empty, transmitter empty
            6 => 0xb0, // MSR: DCD, DSR, CTS
            7 => self.scratch,
            _ => 0,
        }
    }

    fn transmit(&mut self, b: u8) {
        if self.transcript.len() < TRANSCRIPT_LIMIT {
            self.transcript.push(b);
        } else {
            self.truncated = true;
        }
        if let Some(s) = self.sink.as_mut() {
            // The console is best effort: a closed stdout must not kill the VM.
            let _ = s.write_all(&[b]);
            if b == b'\n' {
                let _ = s.flush();
            }
        }
    }

    /// Everything the guest printed (up to [`TRANSCRIPT_LIMIT`]).
    pub(crate) fn transcript(&self) -> &[u8] {
        &self.transcript
    }

    pub(crate) fn truncated(&self) -> bool {
        self.truncated
    }

    pub(crate) fn flush(&mut self) {
        if let Some(s) = self.sink.as_mut() {
            let _ = s.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_reach_the_sink_and_the_transcript() {
        let mut out = Vec::new();
        {
            let mut s = Serial::new(Some(&mut out));
            for b in b"FW hi\n" {
                s.write(COM1, *b);
            }
            assert_eq!(s.transcript(), b"FW hi\n");
            assert_eq!(s.read(COM1 + 5) & 0x60, 0x60);
        }
        assert_eq!(out, b"FW hi\n");
    }

    #[test]
    fn divisor_latch_writes_are_not_output() {
        let mut s = Serial::new(None);
        s.write(COM1 + 3, 0x80);
        s.write(COM1, 0x01);
        s.write(COM1 + 3, 0x03);
        s.write(COM1, b'x');
        assert_eq!(s.transcript(), b"x");
        assert_eq!(s.read(COM1 + 3), 0x03);
    }
}
