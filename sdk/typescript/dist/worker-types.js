const stamp = () => new Date().toISOString().slice(11, 23);
export const stderrLogger = (verbose = false) => ({
    info: verbose ? (m) => process.stderr.write(`[${stamp()}] ${m}\n`) : () => { },
    warn: (m) => process.stderr.write(`[${stamp()}] warning: ${m}\n`),
    error: (m) => process.stderr.write(`[${stamp()}] error: ${m}\n`),
});
