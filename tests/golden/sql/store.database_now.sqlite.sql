SELECT strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
