// Node's gearman module (npm "gearman") as a new user drives gearhorn, for
// tests/integration/test_client_libraries.py. Usage as
// tests/clients/gearman_client.php; a job "throw:MSG" is answered with
// sendWorkException(MSG), anything else "node:<length>:<sha256>" after a
// WORK_DATA and a WORK_STATUS.
const crypto = require('crypto')
const gearman = require('gearman')

const [mode, host, port, func, arg] = process.argv.slice(2)
const conn = gearman(host, Number(port), {timeout: 60000})
const sha256 = (data) => crypto.createHash('sha256').update(data).digest('hex')
const say = (obj) => process.stdout.write(JSON.stringify(obj) + '\n')

if (mode === 'call') {
  let started = 0
  const end = (status) => (job) => {
    say({status, data: job.payload ? job.payload.toString('utf8') : null,
         seconds: (Date.now() - started) / 1000})
    conn.close()
  }
  conn.on('WORK_COMPLETE', end('complete'))
  conn.on('WORK_FAIL', end('failed'))
  conn.on('WORK_EXCEPTION', end('exception'))
  conn.connect(() => {
    conn.setOption('exceptions')
    started = Date.now()
    conn.submitJob(func, Buffer.from(arg))
  })
} else if (mode === 'background') {
  conn.on('JOB_CREATED', (handle) => { say({handle}); conn.close() })
  conn.connect(() => conn.submitJob(func, Buffer.from(arg), {background: true}))
} else if (mode === 'worker') {
  let left = Number(arg)
  conn.on('JOB_ASSIGN', (job) => {
    const data = job.payload
    say({length: data.length, sha256: sha256(data)})
    const text = data.toString('utf8')
    if (text.startsWith('throw:')) {
      conn.sendWorkException(job.handle, text.slice(6))
    } else {
      conn.sendWorkData(job.handle, 'working')
      conn.sendWorkStatus(job.handle, '1', '1')  // this library wants text
      conn.sendWorkComplete(job.handle, `node:${data.length}:${sha256(data)}`)
    }
    if (--left <= 0) { setTimeout(() => conn.close(), 100); return }
    conn.preSleep()
  })
  conn.on('NOOP', () => conn.grabJob())
  conn.connect(() => { conn.addFunction(func); conn.preSleep() })
}
